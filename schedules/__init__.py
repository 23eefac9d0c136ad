"""Operator templates: one file per operator with its compute, knobs, schedule and reference."""
