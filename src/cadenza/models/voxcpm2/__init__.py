"""VoxCPM 2 (OpenBMB): MiniCPM-4 text-semantic LM, residual acoustic LM, local diffusion decoder and the
AudioVAE V2 codec (16 kHz in, 48 kHz out), one concept per module of this package."""
