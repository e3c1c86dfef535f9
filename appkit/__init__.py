"""What every app of the repository shares, beneath `models`: command-line conventions (`cli`)
and files written whole or not at all (`files`). It imports nothing from the project."""
