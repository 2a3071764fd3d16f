"""flowerapp: A Flower / PyTorch app."""
