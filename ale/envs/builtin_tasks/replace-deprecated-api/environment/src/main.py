from compat import old_fetch

a = old_fetch("x")
b = old_fetch("y")
