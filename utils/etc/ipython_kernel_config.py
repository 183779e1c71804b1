# Copied into <environment>/etc/ipython/ by `python -m utils.px --install` (make's first step), so
# every IPython kernel of the course's environment loads utils.px: until a cluster runs, its %%px
# tells the learner to run the lab's set-up cell instead of "Cell magic `%%px` not found".
c = get_config()  # noqa: F821 (IPython defines it while it reads this file)
c.InteractiveShellApp.extensions.append("utils.px")
