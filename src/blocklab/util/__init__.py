"""Small utilities every layer may use: errors, the config base class, folder locks, disk-full
handling, checksums, file modes and path text. They import nothing of blocklab above this package."""
