"""What runs inside Triton: the Python models' request logic (tokenize, detokenize, stop phrases, the BLS,
the engines and the service that feeds them) and the one edge to `pb_utils` (triton_adapter.py). Imports
only facts/."""
