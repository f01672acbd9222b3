"""What a channel worker commits after each read (``replicator.pipeline.worker.commit_action``):
a durable target's group of a backlog is committed when the backlog ends, also when its last
read released nothing (time ticks only), instead of waiting for the source's next write or the
channel's next idle save."""

from __future__ import annotations

from replicator.pipeline.worker import _Read, commit_action

AT = b"\x07" + bytes(7)


def test_released_data_goes_with_the_reads_position() -> None:
    read = _Read(ready=["an insert"], commit_at=AT)  # type: ignore[list-item]
    assert commit_action(read, grouped=False, backlog=True, idle_due=False) == (read.ready, AT)


def test_a_read_of_ticks_only_commits_nothing_unless_a_group_is_open() -> None:
    ticks = _Read(commit_at=AT)  # a tick moved the position, nothing was released
    assert commit_action(ticks, grouped=False, backlog=False, idle_due=False) is None
    # an open group: committed with the new position (grouped on if the backlog goes on;
    # ChannelCheckpoint.commit decides with ``more``)
    assert commit_action(ticks, grouped=True, backlog=True, idle_due=False) == ([], AT)
    assert commit_action(ticks, grouped=True, backlog=False, idle_due=False) == ([], AT)


def test_an_open_group_is_committed_when_a_read_finds_nothing_more() -> None:
    nothing = _Read()  # an empty read, or records that neither release nor move the position
    assert commit_action(nothing, grouped=True, backlog=False, idle_due=False) == ([], None)
    assert commit_action(nothing, grouped=True, backlog=True, idle_due=False) is None
    assert commit_action(nothing, grouped=False, backlog=False, idle_due=True) is None


def test_applied_ddl_or_an_idle_save_moves_the_position() -> None:
    changed = _Read(commit_at=AT, changed=True)
    assert commit_action(changed, grouped=False, backlog=False, idle_due=False) == ([], AT)
    idle = _Read(commit_at=AT)
    assert commit_action(idle, grouped=False, backlog=False, idle_due=True) == ([], AT)
