"""specli reads text as UTF-8. Bytes that are not are refused in one line that says which
encoding was expected and how to convert them."""

from __future__ import annotations

from specli.errors import SpecliError


def guess_source_encoding(data: bytes) -> str:
    """What to name in the iconv hint: UTF-16 when the bytes start with its byte-order mark
    (Windows PowerShell's redirection writes that), else LATIN1, the usual 8-bit culprit."""
    return "UTF-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "LATIN1"


def decode_utf8(data: bytes, what: str, convert: str) -> str:
    """``data`` as text, read as ``open()`` reads text (universal newlines); a UTF-8 byte-order
    mark is dropped. ``what`` names the input in the error; ``convert`` is the example command,
    with ``{enc}`` where the source encoding goes."""
    try:
        return data.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n")
    except UnicodeDecodeError as e:
        enc = guess_source_encoding(data)
        raise SpecliError(f"{what} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); specli "
                          f"expects UTF-8: convert it first, e.g. {convert.format(enc=enc)}") from None


def read_utf8(path: str, what: str, convert: str) -> str:
    """The text of the file ``path`` (``what`` names it in the one-line errors: "prompt file",
    "batch file"), decoded as :func:`decode_utf8` does."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise SpecliError(f"{what} not found: {path}") from None
    except OSError as e:
        raise SpecliError(f"cannot read {what} {path}: {e.strerror or e}") from None
    return decode_utf8(data, f"{what} {path}", convert)
