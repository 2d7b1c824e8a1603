"""I/O adapters for binproto: each connects the Sans-IO core to one I/O library.

Import them as ``binproto.adapters.<name>``; the optional dependencies each one
needs are installed by the matching extra (``binproto[h11]``, ``binproto[trio]``).
"""

__all__ = ["missing_extra"]


def missing_extra(exc: ModuleNotFoundError, extra: str) -> ModuleNotFoundError:
    """The error an adapter raises when an optional dependency is missing:
    it names the extra that installs it (``pip install "binproto[h11]"``)."""
    return ModuleNotFoundError(
        f"No module named {exc.name!r}: this part of binproto needs the {extra!r} extra"
        f' (pip install "binproto[{extra}]")',
        name=exc.name,
    )
