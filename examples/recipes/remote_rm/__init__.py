"""The remote reward-model recipe's stand-in RM server (``standin_rm``)."""
