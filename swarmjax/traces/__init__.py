"""Orchestration traces (DESIGN.md section 6): export episodes as replayable JSON."""
