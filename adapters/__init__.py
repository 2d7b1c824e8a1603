"""I/O adapters for binproto: each connects the Sans-IO core to one I/O library.

Import them as ``binproto.adapters.<name>``; the optional dependencies each one
needs are installed by the matching extra (``binproto[h11]``, ``binproto[trio]``).
"""
