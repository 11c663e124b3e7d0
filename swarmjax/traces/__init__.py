"""Orchestration traces (docs/design.md section 14): export episodes as replayable JSON."""
