"""On-disk storage: the data directory (`datadir`) and the content-addressed store.

Import from the submodules (``from stratad.store.datadir import open_data_dir``);
this package re-exports nothing so that importing one part never loads the rest.
"""
