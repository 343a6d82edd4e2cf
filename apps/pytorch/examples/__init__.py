"""Example PyTorch apps run by ``bosen launch``: ``cnn`` (Fashion-MNIST). Each declares its tables
from its model (``tables``, named by ``app.tables``) and trains through ``PSModule``."""
