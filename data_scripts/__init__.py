"""Dataset generators and fetchers used by the chapters.

Default runs use only data that ships with a package (scikit-learn's digits, for
example) or that a generator here makes. Fetchers for full-size datasets are real code,
tested on small local fixtures, and fail with a clear message when offline.
Data flows one way: ``data_scripts`` -> chapter -> ``kernels``; the ``kernels`` package
never imports this one.
"""
