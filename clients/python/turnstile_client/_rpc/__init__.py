"""google.rpc's Status and error details as buf generates them (copy_gen.py), for when
googleapis-common-protos is not installed: see turnstile_client.rpc."""
