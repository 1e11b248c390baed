"""The reasoning-gym recipe's data preparation (``prepare``) and reward function (``reward``)."""
