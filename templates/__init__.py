"""Jinja2 templates shipped with msccl-compile."""
