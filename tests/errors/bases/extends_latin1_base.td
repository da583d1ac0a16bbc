# mistake: extends a base design that is not UTF-8 text
design child extends latin1_base

size G = 2
