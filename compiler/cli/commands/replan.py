HELP = "re-plan a saved schedule after a link fails or slows"


def configure(p) -> None:
    pass
