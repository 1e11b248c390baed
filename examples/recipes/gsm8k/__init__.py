"""The GSM8K recipe's data preparation (``prepare``)."""
