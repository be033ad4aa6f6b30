"""Where rules' actions leave the node (I/O): the HTTP webhook sender."""
