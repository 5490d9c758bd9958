"""What every layer uses and that imports nothing of the package: atomic files and staged
folders (`files`), how a message lists many items (`messages`), the machine a
measurement was made on (`machine`)."""
