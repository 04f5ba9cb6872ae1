"""nanoDist workbench: the CLI, the headless runner and the Textual app that drive the engine."""
