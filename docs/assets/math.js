// Renders the formulas pymdownx.arithmatex (generic mode) leaves as \( ... \) and \[ ... \] in
// `.arithmatex` elements with the KaTeX served beside this file, on every page Material shows.
document$.subscribe(() => {
  for (const element of document.querySelectorAll(".arithmatex")) {
    const source = element.textContent.trim();
    const display = source.startsWith("\\[");
    katex.render(source.slice(2, -2), element, { displayMode: display, throwOnError: true });
  }
});
