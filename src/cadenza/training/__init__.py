"""Training code (never imported by inference): the launcher, data preparation and one stage per component."""
