# mistake: the base design is a folder, not a file
design child extends folder_base

size G = 2
