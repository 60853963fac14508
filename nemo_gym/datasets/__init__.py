"""Task datasets on local files: their statistics, and the collation of every dataset a config declares."""

# Which dataset types each collation mode takes (``gym dataset collate --mode``): here, so the command's parser has
# them without importing the collation's code.
MODES = {"train_preparation": ("train", "validation", "benchmark"), "example_validation": ("example",)}
