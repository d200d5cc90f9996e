def old_fetch(url):
  return url
