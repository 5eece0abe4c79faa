"""User-facing errors: one line, naming the file, field and value where there is one."""


class CompileError(Exception):
    """An error the CLI prints as one line (no traceback) and exits with status 2."""

    exit_status = 2


class ProfileError(CompileError):
    pass


class DemandError(CompileError):
    pass


class InfeasibleError(CompileError):
    pass
