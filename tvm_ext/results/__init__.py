"""Reading results: records summarized (``show``), plotted (``report``) and the best
kernel exported (``export``), for a person or, as JSON, for a script."""
