// MathJax 3 settings for pymdownx.arithmatex (generic mode), as Material for MkDocs recommends;
// MathJax itself (tex-svg.js, Apache-2.0, from the mathjax 3.2.2 npm package, with its LICENSE
// beside it) is served from the site, so equations render without a network connection.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
    enableMenu: false
  }
};

// Material's instant navigation (when turned on) swaps pages without reloading: typeset each new
// page.  On a full page load MathJax typesets by itself once it has started.
if (typeof document$ !== "undefined") {
  document$.subscribe(() => {
    if (window.MathJax && typeof MathJax.typesetPromise === "function") {
      MathJax.typesetClear();
      MathJax.texReset();
      MathJax.typesetPromise();
    }
  });
}
