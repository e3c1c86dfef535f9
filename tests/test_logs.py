"""`appkit.logs`: known-harmless framework lines are dropped only inside the block, only them."""

import logging

from appkit.logs import dropping_log_messages


def test_only_the_named_lines_are_dropped_and_only_inside_the_block(caplog):
    logger = logging.getLogger("tests.logs")
    with caplog.at_level(logging.WARNING, logger="tests.logs"):
        with dropping_log_messages("tests.logs", "known noise", "other noise"):
            logger.warning("known noise: dropped")
            logger.warning("other noise: dropped")
            logger.warning("a real problem: shown")
        logger.warning("known noise: shown outside the block")
    assert [record.getMessage() for record in caplog.records] == [
        "a real problem: shown",
        "known noise: shown outside the block",
    ]
