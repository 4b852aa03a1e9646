"""Injection machinery: patch records, the patch registry and the lazy torchrec import hook."""
