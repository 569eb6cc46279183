"""Collectors whose workers are collection nodes reached through torch.distributed."""
