"""The Kafka wire protocol, sans-IO: bytes in, events out, and back; no sockets here."""

import sys


def _load_kio_without_hypothesis() -> None:
    """kio imports hypothesis whenever it is installed (to register test strategies for its
    types), and hypothesis imports pytest and trio: more than a second of start-up for every
    broker and client process in a development environment, none of which uses them. Hide it
    while kio loads, unless the process (a test) imported it already."""
    if "hypothesis" in sys.modules or "kio.static._phantom" in sys.modules:
        return
    sys.modules["hypothesis"] = None  # type: ignore[assignment]  # "import" raises ImportError
    try:
        import kio.static._phantom  # noqa: F401
    finally:
        del sys.modules["hypothesis"]


_load_kio_without_hypothesis()
