"""Small utilities every layer may use: errors, the config base class, folder locks, disk-full
handling, checksums, file modes, path text and figures drawn without pyplot. They import nothing of
blocklab above this package."""
