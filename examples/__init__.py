"""Example models and scripts for cerebras-tf."""
