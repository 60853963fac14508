"""Task datasets on local files: their statistics, and the collation of every dataset a config declares."""
