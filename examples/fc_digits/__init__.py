"""FC classifier on scikit-learn's digits, in the Cerebras model-zoo style (like fc_mnist)."""
