"""A stop step that never ends is given up, and the log says where every thread was."""

from __future__ import annotations

import asyncio
import logging
import threading

from stratalog.broker.stopping import BoundedStop


def test_a_step_given_up_logs_every_threads_stack(caplog):
    release = threading.Event()

    def stuck() -> None:  # a thread blocked as an fsync the kernel never completes would be
        release.wait(30)

    async def main() -> bool:
        stop = BoundedStop(0.2)
        await stop.blocking("a stuck call", stuck)
        release.set()  # (the thread is joined when the loop closes)
        return stop.complete

    caplog.set_level(logging.ERROR, logger="stratalog.broker.stopping")
    try:
        assert asyncio.run(main()) is False
    finally:
        release.set()
    text = caplog.text
    assert "gave up waiting for a stuck call" in text
    assert "where every thread is" in text
    assert "in stuck" in text and "release.wait(30)" in text
