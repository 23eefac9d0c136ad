"""Cost models that rank candidates before they are measured (filled in by issue 4/6)."""
