"""Hardware profiles shipped with msccl-compile (JSON files, loaded by compiler.model.profiles)."""
