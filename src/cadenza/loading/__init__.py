"""Reading weight files safely (``weights_only=True``, safetensors) and loading them strictly into modules."""

from cadenza.loading.state_dict import load_into, read_torch_state_dict

__all__ = ["load_into", "read_torch_state_dict"]
