"""`python -m export.translator`: exports a trained translator, verified (`export.translator.verified_export`)."""

from export.translator.verified_export import main

if __name__ == "__main__":
    main()
