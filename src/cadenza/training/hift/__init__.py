"""HiFT GAN training parts: discriminators, losses, crops with f0 targets, weight-norm export (stage: hift_stage)."""
