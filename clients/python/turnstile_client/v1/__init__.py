"""turnstile.v1's messages and service stub, as buf generates them (copy_gen.py)."""
