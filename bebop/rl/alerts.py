"""The warnings an RL run raises about itself, written to the run (`RunWriter.warn`: the `warnings` stream of
docs/runs.md, which the dashboard shows beside the run) and printed once on stderr above the progress bar.

    no_signal      none of the run's first SILENT_GROUPS prompt groups had completions that scored differently, so
                   every advantage was 0 and the updates left the policy as it was (a task the model cannot solve
                   yet). A single step without signal is ordinary GRPO at a small batch; that many groups is not.
                   Once per run.
    draft_health   the draft-health monitor's alarm (`bebop.rl.draft_health`: acceptance the entropy law does not
                   explain), on the first step of each stretch of alarmed steps; the train stream's `draft_health/*`
                   fields say how every step went.
"""

from __future__ import annotations

from collections.abc import Mapping

SILENT_GROUPS = 16  # groups without any reward signal before a run warns that GRPO has nothing to learn from


class RunAlerts:
    """Watches each step's train record and raises the run's warnings through `writer` (a `RunWriter`, or a
    `NullWriter` on ranks other than 0, which raise nothing)."""

    def __init__(self, writer, groups_per_step: int):
        self.writer, self.groups_per_step = writer, groups_per_step
        self.groups, self.heard = 0, False  # prompt groups so far, and whether any had a signal
        self.alarmed = False  # whether the last step raised the draft-health alarm

    def check(self, step: int, record: Mapping) -> None:
        """The warnings step `step`'s record raises (its `critic/*` and `draft_health/*` fields)."""
        seen = self.groups + self.groups_per_step
        self.heard = self.heard or record["critic/groups_with_signal"] > 0
        if not self.heard and seen >= SILENT_GROUPS > self.groups:
            self.writer.warn(f"none of the run's first {seen} prompt groups had completions that scored differently "
                             f"(mean reward {record['critic/score/mean']:.2f}), so every advantage was 0 and the "
                             "updates left the policy as it was; critic/groups_with_signal logs the share per step",
                             source="no_signal", step=step)
        self.groups = seen
        alarm = bool(record.get("draft_health/alarm"))
        if alarm and not self.alarmed:
            self.writer.warn(record["draft_health/warning"], source="draft_health", step=step)
        self.alarmed = alarm
