"""The workbench's other screens: confirmations, help, starting a run, picking recorded runs, comparing
two."""
