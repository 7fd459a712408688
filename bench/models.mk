# (filled in by the owner of bench)
