from compat import old_fetch

old_fetcher = 1


def get(u):
  return old_fetch(u) + old_fetch(u + "/2")
