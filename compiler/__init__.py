"""msccl-compile: plan collective-communication algorithms and lower them to MSCCL XML."""

__version__ = "0.1.0"
