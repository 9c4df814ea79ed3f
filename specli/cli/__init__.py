"""The ``specli`` command line: parses options, calls the library, prints. One module a
command (or a few related ones); ``common`` holds what they share."""

from specli.cli import bench, chat, convert, export, local, models, run, serve  # noqa: F401  (registers the commands)
from specli.cli.common import app


def main() -> None:
    app()
