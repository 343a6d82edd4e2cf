"""Apps that train on Bösen-py. Every app ``bosen.apps.<name>`` has the same files: ``data``,
``kernels`` (LDA: ``sampling`` and ``evaluation``), ``model``, ``worker``, ``__main__`` (see
docs/app-contract.md); ``protocol`` is what
they may use of a client, ``runner`` their entry point, ``textparse`` their readers' byte parsers."""
