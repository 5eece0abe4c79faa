"""Back ends: MSCCL XML, torch.distributed, benchmarks."""
