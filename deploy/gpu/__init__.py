"""GPU hosts: the wheelhouse an offline GPU host installs from (``make wheelhouse``) and ``make gpu-check``."""
