"""The one service the faces call: it joins the catalog, the core and the analysis into the use
cases (predict with memory, explore, the mesh, the validation tables, simulate, calibrate) and
returns typed results whose ``as_dict`` is the documented JSON. The command line and the web app
call it and hold no formula and no use-case logic of their own."""
