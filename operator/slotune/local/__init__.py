"""`slotune tune --local`: the study run on this machine (`runner`), engines started as
processes (`process`), and the report and plots it writes (`report`, `plots`)."""
